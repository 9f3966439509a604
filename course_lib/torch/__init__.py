"""PyTorch ports of ``course_lib.numpy``: same module and function names, batched, autograd,
device- and dtype-agnostic, plus ``nn.Module`` wrappers."""
