"""torch.distributed backends that polydist adds (registered when polydist is imported)."""
