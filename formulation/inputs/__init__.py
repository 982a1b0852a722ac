"""What the user gives: the instance file and its model, training job and cluster sections."""
