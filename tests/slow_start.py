"""A loading target in a module that takes seconds to import: what a loading process slow to start
(a busy machine) looks like to the pool, made certain."""

import time

time.sleep(3)


def quick(item):
    return f"loaded {item}"
