"""tailrace persistence package."""
