"""localchat.app"""
