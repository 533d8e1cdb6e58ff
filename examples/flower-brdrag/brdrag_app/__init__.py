"""A Flower app on scikit-learn's digits: plain Flower + fedshield's BR-DRAG strategy."""
