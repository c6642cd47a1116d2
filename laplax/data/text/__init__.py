"""laplax/data/text"""
