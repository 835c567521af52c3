"""localchat.themes"""
