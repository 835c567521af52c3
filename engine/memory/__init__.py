"""Memory accounting: one footprint model, the planner, the device budget, the report.

``footprint.py`` (bytes of weights per format, KV cache and one step's activations, in torch
dtypes), ``planner.py`` (``plan_memory`` -> ``MemoryPlan``: the best weight format and context
that fit a budget), ``budget.py`` (``DeviceSpec``, free memory and the default budget, sizes,
process RSS), ``report.py`` (predicted vs measured for a loaded engine) and ``auto.py``
(``--quant auto``: the plan applied at load time). Import the submodules directly: this package
imports none of them, so ``budget.parse_size`` stays cheap for the CLI.
"""
