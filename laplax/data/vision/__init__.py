"""laplax/data/vision"""
