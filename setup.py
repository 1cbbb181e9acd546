"""Package layout for setuptools (the metadata lives in pyproject.toml).

`templates/` and `grammar/` stay at the top of the repository and ship inside the wheel as
`sas/templates/` and `sas/grammar/` (package-dir maps them): `sas.codegen.triton_backend`
and `sas.lang.text` find them there through `importlib.resources` when sas is installed,
and next to the `sas` folder in a source checkout or an editable install.
"""

from setuptools import find_packages, setup

#: data-only packages inside the wheel -> their folder in the repository
DATA_PACKAGES = {"sas.templates": "templates", "sas.templates.triton": "templates/triton",
                 "sas.templates.nki": "templates/nki", "sas.grammar": "grammar",
                 "sas.templates.cuda": "templates/cuda"}

setup(
    packages=find_packages(include=["sas", "sas.*"]) + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
    package_data={"sas": ["py.typed"], "sas.templates.triton": ["*.jinja"],
                  "sas.templates.nki": ["*.jinja"], "sas.grammar": ["*.lark"],
                  "sas.templates.cuda": ["*.jinja"]},
)
