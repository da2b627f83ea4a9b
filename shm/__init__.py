"""tailrace shm package."""
