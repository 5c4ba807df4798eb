"""Draws GhostEdit's example input images (assets/examples/*.png) with Pillow: deterministic, made by the project."""
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter

OUT = Path(__file__).resolve().parent.parent / "assets" / "examples"
SIZE = 512


def vertical_gradient(top, bottom, size=(SIZE, SIZE)):
    image = Image.new("RGB", size)
    draw = ImageDraw.Draw(image)
    for y in range(size[1]):
        t = y / (size[1] - 1)
        draw.line([(0, y), (size[0], y)], fill=tuple(round(a + (b - a) * t) for a, b in zip(top, bottom)))
    return image


def house():
    image = vertical_gradient((120, 180, 235), (220, 235, 250))
    draw = ImageDraw.Draw(image)
    draw.ellipse((390, 40, 470, 120), fill=(255, 215, 80))
    draw.rectangle((0, 380, SIZE, SIZE), fill=(90, 160, 80))
    draw.rectangle((140, 230, 370, 400), fill=(200, 90, 70))
    draw.polygon([(120, 235), (255, 130), (390, 235)], fill=(110, 60, 50))
    draw.rectangle((235, 310, 285, 400), fill=(80, 50, 30))
    for x in (165, 305):
        draw.rectangle((x, 260, x + 45, 300), fill=(250, 240, 190), outline=(60, 40, 30), width=3)
    return image


def portrait():
    image = vertical_gradient((60, 70, 110), (150, 120, 170))
    draw = ImageDraw.Draw(image)
    draw.ellipse((156, 100, 356, 330), fill=(236, 196, 160))
    draw.pieslice((146, 80, 366, 260), 180, 360, fill=(70, 45, 30))
    for x in (205, 275):
        draw.ellipse((x, 190, x + 32, 214), fill=(255, 255, 255))
        draw.ellipse((x + 9, 194, x + 25, 210), fill=(50, 90, 140))
    draw.arc((215, 240, 297, 295), 20, 160, fill=(160, 60, 60), width=5)
    draw.rectangle((176, 330, 336, SIZE), fill=(60, 120, 150))
    draw.ellipse((96, 380, 416, 620), fill=(60, 120, 150))
    return image


def mountains():
    image = vertical_gradient((250, 170, 120), (120, 90, 150))
    draw = ImageDraw.Draw(image)
    draw.polygon([(0, 400), (140, 180), (260, 330), (370, 150), (SIZE, 360), (SIZE, SIZE), (0, SIZE)], fill=(70, 60, 90))
    draw.polygon([(370, 150), (340, 200), (400, 200)], fill=(240, 240, 250))
    draw.polygon([(140, 180), (112, 225), (168, 225)], fill=(240, 240, 250))
    draw.rectangle((0, 430, SIZE, SIZE), fill=(50, 90, 120))
    return image.filter(ImageFilter.SMOOTH)


def house_mask():
    """The house's front wall, door and windows (white = change): the masked edits' example and the bench's."""
    image = Image.new("L", (SIZE, SIZE), 0)
    ImageDraw.Draw(image).rectangle((150, 245, 360, 405), fill=255)
    return image


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, draw in (("house", house), ("portrait", portrait), ("mountains", mountains),
                       ("house-mask", house_mask)):
        draw().save(OUT / f"{name}.png", optimize=True)
        print(OUT / f"{name}.png")


if __name__ == "__main__":
    main()
