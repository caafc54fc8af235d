"""Common English words: the raw material of benchmark prompts.

Short and frequent, so most tokenizers count each (after a space) as one token; the
bench keeps only those the server's own tokenizer does count as one.
"""

WORDS = tuple(
    """
    the of and to in is was for that with as on by at from his her an were are which this be
    has had not but its they their been one also who all more first after new two other when
    time year years people world city state house school water night day week month family
    group part place case point number line side head hand eye face door room book story
    word name home land road river light fire tree field ground sea sun moon star wind rain
    snow stone wood paper glass metal gold silver iron salt bread milk tea wine fruit apple
    horse dog cat bird fish cow sheep king queen law war peace army court church market
    money price trade bank office board team game music song film art color voice sound
    power energy heat cold age life death body blood heart mind idea fact reason answer
    question problem plan rule form kind sort type level range rate size weight length
    black white red green blue brown dark bright open close short long high low early late
    small large great good bad old young free full clear strong simple common local public
    north south east west left right front back top bottom inside outside above below near
    far today still often never always again soon once ever very much many few some each
    every both either such same own only just even about over under between through
    during before until since while because though however around across along toward
    make take give find tell ask work call try need feel become leave put mean keep let
    begin seem help show hear play run move live hold bring write sit stand lose pay meet
    include continue set learn change lead understand watch follow stop create speak read
    allow add spend grow offer remember love consider appear buy wait serve die send build
    stay fall cut reach kill remain suggest raise pass sell decide return explain hope
    develop carry break receive agree support hit produce eat cover catch draw choose
    """.split()  # noqa: SIM905 (a literal of 343 quoted words would read worse)
)
