"""NumPy reference implementations: clear, float64-friendly, and the oracle for the PyTorch tree.

Nothing in this tree imports torch.
"""
