"""The hand-written founders every arm starts from: one per corner of the genre x tone plane, and two
between."""

SEED_TEXTS = (
    "The rain keeps falling on the empty chair,\nyour coat still hangs beside the door.\n"
    "I set two cups out of old habit\nand pour for no one anymore.\n",
    "Morning spills its honey on the hill,\nthe bees are dancing, loud and gold.\n"
    "I run barefoot through the clover\nand the day is mine to hold.\n",
    "The last bus left without him. Tom sat on the cold bench with the letter in his hand, read it a "
    "third time, and finally understood that she was not coming back.\n",
    "Maya found a lost puppy under the bakery steps. By evening it had a name, a red collar and a warm "
    "spot by the oven, and the whole street came by to say hello.\n",
    "Grey harbour, grey gulls,\nthe ferry hums and leaves again.\nSome go, some stay.\n",
    "On Tuesday the lighthouse keeper painted the door blue. Nobody asked why, and he did not say.\n",
)
