"""Measurements of meshbench's own code (run as commands; nothing at run time imports them)."""
