"""tailrace router package."""
