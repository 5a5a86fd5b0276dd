from services.shadow_comparator.app import main

if __name__ == "__main__":
    main()
