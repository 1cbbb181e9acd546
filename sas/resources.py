"""Where sas finds its data folders: the kernel templates and the `.sas` grammar.

In the repository they sit at the top, beside the `sas` package (`templates/`, `grammar/`);
the wheel ships them inside it (`sas/templates/`, `sas/grammar/`; see setup.py). Both
places are looked up relative to the `sas` package that is actually imported, through
`importlib.resources`, so a source checkout on PYTHONPATH never picks up the data of another
installed copy of sas (an editable install's import hook would map `sas.grammar` to that
copy's folder).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # importlib.resources.abc is new in Python 3.11
    from importlib.resources.abc import Traversable

__all__ = ["data_folder"]


def data_folder(name: str) -> Traversable:
    """The folder `name` ("templates" or "grammar"): inside the installed package when it is
    there (a wheel install), else beside the package (a source checkout, an editable install).

    Returns the in-package location when neither exists, so that error messages name where
    an installed sas looks.
    """
    inside = resources.files("sas") / name
    if inside.is_dir():
        return inside
    beside = Path(str(resources.files("sas"))).parent / name
    return beside if beside.is_dir() else inside
