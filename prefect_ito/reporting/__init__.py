"""What a person sees in Prefect.

Artifact cards, the loss chart, events relayed from the backend, markdown made inert, and the
event that chains training after a booking.
"""
