"""localchat.engine.loader"""
