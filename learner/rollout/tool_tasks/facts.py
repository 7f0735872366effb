"""The `lookup` tool's database: fictional towns and products, so that no model can know a
value without calling the tool (a real city's population it might remember).

Literal on purpose: the tasks' reference answers are computed from these numbers, and a
table written out here cannot drift with a random generator's implementation. Product names
are a brand and a noun whose plural takes an "s" (the questions say "7 Zephyr stools").
"""

from __future__ import annotations

TOWN_FIELDS = ("population", "area_km2", "elevation_m")
PRODUCT_FIELDS = ("price_usd", "weight_kg")
FIELDS = TOWN_FIELDS + PRODUCT_FIELDS


def _town(population: int, area_km2: float, elevation_m: int) -> dict[str, float]:
    return {"population": population, "area_km2": area_km2, "elevation_m": elevation_m}


def _product(price_usd: float, weight_kg: float) -> dict[str, float]:
    return {"price_usd": price_usd, "weight_kg": weight_kg}


TOWNS: dict[str, dict[str, float]] = {
    "Varnholt": _town(34319, 84.3, 251),
    "Quellby": _town(85268, 22.7, 1889),
    "Osterfen": _town(7164, 47.4, 201),
    "Marrowick": _town(45653, 17.8, 1241),
    "Tillbury": _town(57654, 15.6, 643),
    "Drannoch": _town(65780, 122.8, 329),
    "Feldmoor": _town(61150, 13.6, 1140),
    "Heskeby": _town(58217, 62.8, 2152),
    "Ulvaston": _town(56515, 120.4, 1588),
    "Corrabel": _town(84787, 40.5, 539),
    "Pendrith": _town(59681, 41.9, 1911),
    "Saltmere": _town(57291, 16.3, 319),
    "Wyncombe": _town(22263, 142.8, 2736),
    "Ardenvale": _town(80740, 98.8, 2335),
    "Brolley": _town(31831, 166.1, 933),
    "Kestwick": _town(9573, 64.9, 2697),
    "Lowmarsh": _town(90843, 152.8, 2304),
    "Ormsgate": _town(63509, 27.6, 2636),
    "Ravelin": _town(18096, 73.5, 787),
    "Sunderby": _town(44305, 140.3, 408),
    "Thistlecombe": _town(59840, 73.1, 1809),
    "Yarrowfield": _town(52074, 166.7, 2341),
    "Glenmoor": _town(87211, 58.7, 2431),
    "Haverleigh": _town(7493, 147.1, 1599),
}

PRODUCTS: dict[str, dict[str, float]] = {
    "Zephyr stool": _product(209.5, 21.2),
    "Corvid jacket": _product(446.99, 18.3),
    "Halden toaster": _product(187.99, 24.8),
    "Mistral kayak": _product(122.5, 4.1),
    "Ember scooter": _product(122.5, 12.7),
    "Quill tent": _product(305.99, 7.5),
    "Tundra mirror": _product(218.0, 9.7),
    "Basalt heater": _product(316.5, 17.9),
    "Juniper chair": _product(320.0, 17.6),
    "Nimbus drill": _product(237.0, 20.7),
    "Orrin backpack": _product(204.99, 10.3),
    "Pellar fan": _product(250.99, 1.8),
    "Zephyr lantern": _product(38.99, 4.4),
    "Corvid kettle": _product(60.5, 2.9),
    "Halden pump": _product(81.0, 2.8),
    "Mistral blender": _product(190.5, 22.6),
    "Ember desk": _product(110.5, 16.5),
    "Quill radio": _product(181.99, 12.4),
    "Tundra lamp": _product(63.99, 12.2),
    "Basalt speaker": _product(249.5, 3.9),
    "Juniper clock": _product(179.0, 7.0),
    "Nimbus mixer": _product(249.5, 13.5),
    "Orrin helmet": _product(109.99, 4.0),
    "Pellar rug": _product(357.5, 19.7),
}

FACTS: dict[str, dict[str, float]] = TOWNS | PRODUCTS
