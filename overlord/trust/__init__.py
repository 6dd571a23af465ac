"""The records of trust: the keyed audit chain and its witness, policy, the content gate,
protected paths and the second model's verdicts. Domain code: faces never import it; the
service layer (overlord/ops) calls it."""
