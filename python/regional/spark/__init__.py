"""The plumbing at the edges: the data source, reader and writer, the listener, the session, the JVM shim."""
