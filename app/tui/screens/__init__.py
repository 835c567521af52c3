"""The TUI's screens: the chat screen and its modal dialogs."""
