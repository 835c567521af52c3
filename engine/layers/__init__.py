"""localchat.engine.layers"""
