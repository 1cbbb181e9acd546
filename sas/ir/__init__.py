"""Intermediate representations of a pattern: periodic structure, polygons, tiles."""

from sas.ir.periodicity import Structure, structure

__all__ = ["Structure", "structure"]
