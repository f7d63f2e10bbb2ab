"""Pieces of the training scripts that subprocess tests run with ``python -c``, pasted into their
text (``%(loop)s``): the scripts run in a folder of their own, where ``tests`` is not importable;
and the test's side of their markers (`marker_from`)."""

import time

#: a tiny model and its optimizer, and ``train(steps)``: that many steps of its loop
TINY_LOOP = """
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)

def train(steps):
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
"""

#: ``wait_for(name)``: until the test puts the file ``name`` in the folder ``markers`` (5 minutes
#: at most: a test that never does fails)
WAIT_FOR_MARKER = """
def wait_for(name):
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(markers, name)):
        assert time.monotonic() < deadline, name
        time.sleep(0.05)
"""


def marker_from(path, proc, deadline_s=300):
    """Wait for the script ``proc`` to write the marker file ``path``; its end or 5 minutes without
    it fail the test (with the script's output)."""
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)
