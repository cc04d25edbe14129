"""The group coordinator's pure cores: no I/O, no clocks, no asyncio."""
