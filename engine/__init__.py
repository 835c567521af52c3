"""localchat.engine"""
