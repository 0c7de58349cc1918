"""A case's properties searched: Hypothesis searches, their cases and database, enumeration, policy arithmetic."""
