"""Training and retraining of the learned complexity scorer (scikit-learn; never imported by the request path)."""
