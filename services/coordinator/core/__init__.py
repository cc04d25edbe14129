"""Pure logic of the transaction coordinator: no I/O, clocks or randomness."""
