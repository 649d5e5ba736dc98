import os
import sys

# The rank launcher lives beside the tests; spawned ranks import test modules by name from here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
