"""Example consumers of the change streams, shipped and tested: a budget guard and a mirror."""
