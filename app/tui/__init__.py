"""localchat.app.tui"""
