"""localchat.engine.models"""
