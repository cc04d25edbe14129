"""The store node's part in transactions: transaction markers and hanging
transactions (markers.py), the port that asks coordinators about a hanging
transaction (resolver.py), and the port that verifies a producer's first
transactional write (verifier.py)."""
