"""localchat.app: the command line (``cli.py``) and, later, the Textual TUI; thin shells over
the engine."""
