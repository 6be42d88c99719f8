"""The epoch protocol, pure: settings, then plan -> stage -> decide -> publish -> record (``epoch``)."""
