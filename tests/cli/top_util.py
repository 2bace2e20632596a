"""What the `pjserve top` tests share besides fixtures (a module of its own
name: test modules never import `conftest`, which names another directory's
conftest when several test directories run in one session)."""

from protocol_util import RELOAD_MODEL

# mlp and its renamed copy (2704 bytes of weights each) do not fit together
# in the budget.
MODELS = ("mlp", RELOAD_MODEL, "two_io")
BUDGET = "3Ki"
BUDGET_BYTES = 3 * 1024
