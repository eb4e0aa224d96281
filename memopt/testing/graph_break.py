"""A step SOT cannot trace in one piece: a Python ``if`` on a tensor's value
between two stacks of Linear layers splits it into two subgraphs (two
training programs), with the comparison run eagerly between them."""
import paddle
from paddle import nn

__all__ = ["GraphBreak"]


class GraphBreak(nn.Layer):
    """``forward(x)``: 4 Linear+ReLU, a Python branch on ``x.mean()``, 4 more,
    the mean as the loss."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.a = nn.LayerList([nn.Linear(width, width) for _ in range(4)])
        self.b = nn.LayerList([nn.Linear(width, width) for _ in range(4)])

    def forward(self, x):
        for layer in self.a:
            x = paddle.nn.functional.relu(layer(x))
        if float(x.mean()) > 1e9:  # never true: the break is what matters
            x = x * 2
        for layer in self.b:
            x = paddle.nn.functional.relu(layer(x))
        return x.mean()
