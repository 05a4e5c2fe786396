"""flashlab.lessons.vector_add: the first kernel of the course, against PyTorch, and its errors."""

import pytest
import torch

from flashlab.lessons.vector_add import vector_add


@pytest.mark.parametrize("n", [1, 129, 2048])
def test_matches_torch(n):
    x, y = torch.randn(n), torch.randn(n)
    torch.testing.assert_close(vector_add(x, y, block=128), x + y, rtol=0, atol=0)


@pytest.mark.parametrize("x,y,block,argument", [
    (torch.ones(4), torch.ones(5), 128, "^y:"),
    (torch.ones(2, 2), torch.ones(2, 2), 128, "^y:"),
    (torch.ones(4), torch.ones(4, dtype=torch.float16), 128, "^y:"),
    (torch.ones(8)[::2], torch.ones(4), 128, "^x, y:"),
    (torch.ones(4), torch.ones(4), 100, "^block:"),
])
def test_bad_inputs_name_the_argument(x, y, block, argument):
    with pytest.raises(ValueError, match=argument):
        vector_add(x, y, block=block)
