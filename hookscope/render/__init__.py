"""Everything that draws or writes: Rich tables, trees and progress, JSON/CSV/PNG files.

This package is the only place that imports Rich; the library hands it plain data.
"""
