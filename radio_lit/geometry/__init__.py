"""Where features lie: feature grids and shift-equivariant views, as functions of tensors.

- :mod:`.grid`: bringing a student's and a teacher's feature maps to one grid (AM-RADIO 4,
  PHI-S 3, RADIOv2.5 4.2 policies; antialiased shrinking).
- :mod:`.shifts`: C-RADIOv4's shift-equivariant views: patch shifts, crop-frame re-indexing,
  overlap masks.
"""
