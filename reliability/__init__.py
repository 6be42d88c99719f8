"""The reliability campaign: random driver kills against each target and source, checked record by record.

``python -m reliability.run`` runs it and writes RELIABILITY.md; ``integration/test_random_kills.py`` runs a
few trials of it in the test command.
"""
