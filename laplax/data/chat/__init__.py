"""laplax/data/chat"""
