"""A small stock-keeping module: items, a store of them, and a text report."""

import csv
import json
from dataclasses import dataclass, field


@dataclass
class Item:
    sku: str
    name: str
    price: float
    quantity: int = 0
    tags: list = field(default_factory=list)

    def value(self):
        return self.price * self.quantity

    def is_low(self, threshold=5):
        return self.quantity < threshold


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, item):
        if item.sku in self.items:
            raise ValueError(f"duplicate sku {item.sku}")
        self.items[item.sku] = item

    def remove(self, sku):
        return self.items.pop(sku)

    def restock(self, sku, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.items[sku].quantity += amount

    def sell(self, sku, amount):
        item = self.items[sku]
        if amount > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} left")
        item.quantity -= amount
        return item.price * amount

    def total_value(self):
        return sum(item.value() for item in self.items.values())

    def low_stock(self, threshold=5):
        return [item for item in self.items.values() if item.is_low(threshold)]

    def by_tag(self, tag):
        return [item for item in self.items.values() if tag in item.tags]

    def search(self, text):
        text = text.lower()
        return [item for item in self.items.values() if text in item.name.lower()]


def load_csv(path):
    inventory = Inventory()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            tags = [t for t in row.get("tags", "").split(";") if t]
            inventory.add(Item(row["sku"], row["name"], float(row["price"]), int(row["quantity"]), tags))
    return inventory


def save_json(inventory, path):
    data = [
        {"sku": i.sku, "name": i.name, "price": i.price, "quantity": i.quantity, "tags": i.tags}
        for i in inventory.items.values()
    ]
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def format_row(item, width=24):
    name = item.name if len(item.name) <= width else item.name[: width - 1] + "~"
    return f"{item.sku:<8} {name:<{width}} {item.quantity:>5} {item.price:>9.2f} {item.value():>10.2f}"


def report(inventory, threshold=5):
    lines = [f"{'SKU':<8} {'NAME':<24} {'QTY':>5} {'PRICE':>9} {'VALUE':>10}"]
    for item in sorted(inventory.items.values(), key=lambda i: i.sku):
        lines.append(format_row(item))
    lines.append("")
    lines.append(f"total value: {inventory.total_value():.2f}")
    low = inventory.low_stock(threshold)
    if low:
        lines.append("low stock: " + ", ".join(i.sku for i in low))
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print("usage: inventory.py STOCK.csv")
        return 2
    inventory = load_csv(argv[1])
    print(report(inventory))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv))
