"""From recorded segments to slime samples and train data."""
