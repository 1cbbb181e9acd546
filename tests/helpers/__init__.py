"""Shared test helpers, one module per kind of thing they hold (conftest.py holds the fixtures
and the hypothesis profiles):

    helpers.attention  DEV, TOL, qkv(...), reference_attention(...), rel_error(...)
    helpers.examples   ROOT, EXAMPLES, TABLE1_NAMES, example_pattern(name), example_namespace(name)
    helpers.table1     the six Table-1 patterns scaled down: TABLE1_KERNELS (32-token blocks),
                       TABLE1_ANALYSIS (16), TABLE1_H2O (8)
    helpers.h2o        plain_h2o(...), region_last_use(...): the independent H2O reference
"""
