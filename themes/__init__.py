"""localchat.themes: Textual themes (.tcss), shipped as package data (with the TUI)."""
