"""The GPU worker container (issue: GPU worker). Imports torch; never imported by Lambdas."""
