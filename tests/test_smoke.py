import torch
from oracle import check


def test_add_views_and_inplace():
    def program(x):
        v = x[1:, ::2]
        v.add_(100)
        return x + 1, v * 2.5, x.t().contiguous()

    check(program, torch.arange(12, dtype=torch.float32).reshape(3, 4))
