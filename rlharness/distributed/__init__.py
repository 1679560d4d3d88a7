"""Disaggregated mode on Ray: engines and training workers as actors behind local interfaces
(`remote_parts`), and the weight channel that carries each new version to the engines
(`weight_channel`). Nothing is imported here, so a run that needs no Ray never loads it.
"""
