"""localchat.kernels"""
