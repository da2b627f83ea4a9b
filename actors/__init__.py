"""tailrace actors package."""
