"""A deterministic simulation that runs the production runtimes (issue 18).

See simulation.py for the method and docs/testing.md ("The simulation")
for how to run and replay it.
"""
