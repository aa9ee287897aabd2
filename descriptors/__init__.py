"""Behaviour descriptors: genome (and its evaluation) -> descriptor vector.

For numeric experiments the evaluator reports descriptors directly; embedding,
AI-feedback, code-metric and learned descriptors build on this package.
"""
