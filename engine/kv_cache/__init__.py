"""localchat.engine.kv_cache"""
